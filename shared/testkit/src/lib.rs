//! Test harness: scripted OpenAI-compatible server, port-0 servers, whole-mesh sandbox.
