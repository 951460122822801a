"""Chat prompts on a vocabulary as long as real ones: the GGUF reader hands long token-type arrays over
as numpy arrays, which the prompt tokenizer must take as it takes lists."""

from __future__ import annotations

from app.engine.engine import Engine, GenerationSettings, LoadSettings
from app.gguf.meta import NUMPY_ARRAY_THRESHOLD, read_metadata_file
from app.tiny_arch import write_tiny_model


def test_a_long_vocabulary_tokenizes_chats(tmp_path) -> None:
    shape = {"n_vocab": 2 * NUMPY_ARRAY_THRESHOLD}
    path = write_tiny_model(tmp_path / "long-vocab.gguf", "qwen3", shape=shape)
    types = read_metadata_file(path).get("tokenizer.ggml.token_type")
    assert len(types) >= NUMPY_ARRAY_THRESHOLD and not isinstance(types, list)
    with Engine(LoadSettings(str(path), n_ctx=256, n_threads=1)) as eng:
        ids = eng.chat_prompt([{"role": "user", "content": "Hello world!"}])
        assert ids and eng.tokenize("Hello world!")
        assert eng.run(ids, GenerationSettings(mode="plain", max_tokens=4)).tokens
