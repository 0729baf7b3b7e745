//! The fleet gateway: one OpenAI-compatible endpoint that routes each request to a healthy cluster its model is allowed in.
