"""Auto mode: per round, draft with prompt lookup, with the draft model, or not at all, whichever is
expected to deliver the most tokens per second (from measured costs and acceptance learned online).

- :mod:`.priors`: the priors and constants (each justified in docs/benchmarks.md);
- :mod:`.costs`: the cost model (verify cost by batch size, the draft's cost per token);
- :mod:`.acceptance`: acceptance estimates by class of situation, pooled and per reply;
- :mod:`.evidence`: those estimates and realized rates for every source and class (keyed by ``Source``);
- :mod:`.planner`: the draft length with the highest expected rate; when a draft goes on;
- :mod:`.copies`, :mod:`.model_rounds`: planning a copy's round, and a draft model's (its probes:
  :mod:`.probing`);
- :mod:`.memory`: what was learned for a pair on a machine, kept across restarts;
- :mod:`.drafter`: :class:`AutoDrafter`, which puts them together behind the drafter interface.
"""

from app.engine.auto.acceptance import Acceptance, lookup_class, model_class
from app.engine.auto.costs import CostModel, MeasuredCosts
from app.engine.auto.drafter import AutoDrafter
from app.engine.auto.memory import AutoMemory
from app.engine.auto.planner import Plan, best_length
from app.engine.auto.priors import CONFIDENCE_WINDOW, LOOKUP_CLASSES, LOOKUP_MAX, MODEL_CLASSES, REPLY_MIN

__all__ = [
    "CONFIDENCE_WINDOW",
    "LOOKUP_CLASSES",
    "LOOKUP_MAX",
    "MODEL_CLASSES",
    "REPLY_MIN",
    "Acceptance",
    "AutoDrafter",
    "AutoMemory",
    "CostModel",
    "MeasuredCosts",
    "Plan",
    "best_length",
    "lookup_class",
    "model_class",
]
