// Keeps wiola_infer non-empty until its sources land.
namespace wiola::infer {
int placeholder() { return 0; }
}  // namespace wiola::infer
