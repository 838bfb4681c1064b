//! Embedded offline model backends: MiniLM embeddings and GGUF chat models in-process.
