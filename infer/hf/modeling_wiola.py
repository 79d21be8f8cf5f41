# Placeholder: the Hugging Face modeling file for exported Wiola models (written next).
