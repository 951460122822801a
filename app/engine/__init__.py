"""The inference engine: pure Python over llama.cpp. Never imports Qt."""
