// Byte-level BPE training: count the pre-tokenized words of the corpus (in
// parallel over cores), then merge the most frequent adjacent pair until the
// vocabulary is full. Ties go to the smaller (left id, right id) pair, so the
// result does not depend on the number of threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace wiola {

struct BpeTrainOptions {
  uint32_t vocab_size = 32000;  // including the special tokens and the 256 bytes
  std::vector<std::string> special_tokens = {"<pad>", "<bos>", "<eos>", "<unk>",
                                             "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"};
  uint64_t min_frequency = 2;  // stop when the best pair is rarer than this
  int threads = 0;             // 0: all cores
  bool progress = false;       // log to stderr
};

// Trains on the text files (UTF-8; each line is pre-tokenized with its line
// end) and returns a Hugging Face tokenizer.json text (GPT-2 byte-level kind).
// Throws wiola::Error naming a file that is missing, unreadable or not UTF-8.
std::string train_bpe(const std::vector<std::string>& files, const BpeTrainOptions& opt);

}  // namespace wiola
