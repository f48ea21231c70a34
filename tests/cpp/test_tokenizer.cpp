// tests/cpp/test_tokenizer.cpp — placeholder.
