""" "Does speculation pay here?": plain against a drafting mode on the loaded pair (tiny real models)."""

from __future__ import annotations

import pytest

from app.engine import EngineClient, GenerationSettings, LoadSettings
from app.speedcheck import BUILT_IN_PROMPTS, CheckResult, describe, recent_prompts, run_check

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def client(tiny_pair):
    with EngineClient() as c:
        c.load(LoadSettings(target=str(tiny_pair.target), draft=str(tiny_pair.draft), n_ctx=512, n_threads=1))
        yield c


def test_the_check_runs_both_modes_on_each_prompt_interleaved(client) -> None:
    seen: list[tuple[int, int]] = []
    prompts = ["def add(a, b):", "One, two, three, one, two,"]
    mode = GenerationSettings(mode="speculative", n_max=4, adaptive=False)
    result = run_check(client, mode, prompts, max_tokens=24, progress=lambda d, t: seen.append((d, t)))
    assert isinstance(result, CheckResult) and result.own_prompts
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert len(result.ratios) == 2 and result.low <= result.speedup <= result.high
    assert result.mode == "speculative" and result.acceptance is not None and 0 <= result.acceptance <= 1
    assert result.plain_tokens_per_second > 0 and result.mode_tokens_per_second > 0


def test_without_prompts_of_its_own_it_uses_the_built_in_ones_and_plain_means_auto(client) -> None:
    result = run_check(client, GenerationSettings(mode="plain"), max_tokens=8)
    assert result is not None and not result.own_prompts and result.mode == "auto"
    assert len(result.ratios) == len(BUILT_IN_PROMPTS)


def test_a_cancelled_check_reports_nothing(client) -> None:
    assert run_check(client, GenerationSettings(), ["hello"], cancelled=lambda: True) is None


def test_recent_prompts_and_the_words() -> None:
    assert recent_prompts(["b", " ", "a", "b", "c", "d"], 3) == ["b", "a", "c"]
    pays = CheckResult("auto", 1.3, 1.1, 1.5, 0.7, 10.0, 13.0, (1.1, 1.3, 1.5), True)
    assert describe(pays) == (
        "auto: 1.30x plain decoding (1.10-1.50x over 3 of your recent prompts), "
        "70% of drafted tokens accepted; speculation pays here."
    )
    close = CheckResult("speculative", 1.0, 0.9, 1.1, None, 10.0, 10.0, (0.9, 1.1), False)
    assert describe(close).endswith("over 2 of built-in prompts); too close to call.")
