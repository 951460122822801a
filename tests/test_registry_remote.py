"""Remote compatibility checks: header-only Range reads agree with the local check."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.gguf.compat import check_compatible, check_files
from app.gguf.meta import read_metadata_file
from app.tiny_gguf import write_tiny_llama
from fakehub import FakeHub
from models_registry.hub import NotFoundError, RetryPolicy
from models_registry.remote import (
    FIRST_CHUNK,
    HfRef,
    check_pair,
    model_facts,
    parse_hf_ref,
    read_ref_metadata,
    read_remote_metadata,
)

FAST = RetryPolicy(backoff_base=0.01, stall_timeout=2.0, metadata_retries=1)


@pytest.fixture(scope="module")
def big_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tokenizer-'a' target with ~27 MB of tensors (compatible with the tiny draft)."""
    return write_tiny_llama(
        tmp_path_factory.mktemp("big") / "big-target.gguf", n_embd=512, n_ff=1536, name="big-target"
    )


@pytest.fixture
def served(fake_hub: FakeHub, big_target: Path, tiny_pair, tiny_incompatible_draft: Path) -> FakeHub:
    fake_hub.add_file("acme/Big-GGUF", "big-target.gguf", big_target.read_bytes())
    fake_hub.add_file("acme/Tiny-GGUF", "tiny-draft.gguf", tiny_pair.draft.read_bytes())
    fake_hub.add_file("other/Odd-GGUF", "odd.gguf", tiny_incompatible_draft.read_bytes())
    return fake_hub


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("hf://acme/Big-GGUF/big.gguf", HfRef("acme/Big-GGUF", "big.gguf")),
        ("hf://acme/Big-GGUF/big.gguf@v1.0", HfRef("acme/Big-GGUF", "big.gguf", "v1.0")),
        (
            "hf://acme/Big-GGUF/Q8_0/big-00001-of-00002.gguf",
            HfRef("acme/Big-GGUF", "Q8_0/big-00001-of-00002.gguf"),
        ),
    ],
)
def test_parse_hf_ref(ref: str, expected: HfRef) -> None:
    assert parse_hf_ref(ref) == expected
    assert str(expected) == ref


@pytest.mark.parametrize(
    "ref",
    ["hf://acme/big.gguf", "acme/Big-GGUF/big.gguf", "hf://acme/Big-GGUF/../x.gguf", "hf://acme/Big-GGUF/x.bin",
     "hf://ac--me/Big/x.gguf", "hf://acme/Big-GGUF/x.gguf@"],
)  # fmt: skip
def test_parse_hf_ref_rejects(ref: str) -> None:
    with pytest.raises(ValueError):
        parse_hf_ref(ref)


def test_remote_metadata_reads_only_the_header(served: FakeHub, big_target: Path) -> None:
    size = big_target.stat().st_size
    meta, reader = read_remote_metadata("hf://acme/Big-GGUF/big-target.gguf", policy=FAST)
    local = read_metadata_file(big_target)
    assert dict(meta.kv) == dict(local.kv)
    assert reader.size == size
    assert reader.bytes_fetched == served.bytes_served
    assert served.bytes_served <= FIRST_CHUNK < size // 20
    assert model_facts(meta) == model_facts(local)
    facts = read_ref_metadata(HfRef("acme/Big-GGUF", "big-target.gguf"), policy=FAST)[1]
    assert (facts.architecture, facts.n_layers, facts.n_kv_heads, facts.head_dim) == ("llama", 2, 2, 128)
    assert facts.context_length == 4096 and facts.file_size == size


def test_remote_check_agrees_with_local(
    served: FakeHub, big_target: Path, tiny_pair, tiny_incompatible_draft: Path
) -> None:
    ok = check_pair("hf://acme/Big-GGUF/big-target.gguf", "hf://acme/Tiny-GGUF/tiny-draft.gguf", policy=FAST)
    assert ok.ok and ok == check_files(big_target, tiny_pair.draft)

    bad = check_pair("hf://acme/Big-GGUF/big-target.gguf", "hf://other/Odd-GGUF/odd.gguf", policy=FAST)
    local_bad = check_files(big_target, tiny_incompatible_draft)
    assert not bad.ok and bad == local_bad and bad.reason == local_bad.reason

    # a Hub target with a local draft
    mixed = check_pair("hf://acme/Big-GGUF/big-target.gguf", tiny_incompatible_draft, policy=FAST)
    assert mixed == local_bad
    assert served.bytes_served <= 5 * FIRST_CHUNK  # 3 header reads of the 27 MB target + 2 tiny files


def test_remote_errors_are_hub_errors(served: FakeHub) -> None:
    with pytest.raises(NotFoundError, match=r"file 'nope\.gguf' not found"):
        read_remote_metadata("hf://acme/Big-GGUF/nope.gguf", policy=FAST)


def test_local_metadata_matches_check_compatible(tiny_pair) -> None:
    t, _ = read_ref_metadata(tiny_pair.target)
    d, _ = read_ref_metadata(str(tiny_pair.draft))
    assert check_compatible(t, d).ok
