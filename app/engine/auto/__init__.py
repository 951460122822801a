"""Auto mode: per round, draft with prompt lookup, with the draft model, or not at all, whichever is
expected to deliver the most tokens per second (from measured costs and acceptance learned online).

- :mod:`.priors`: the measured priors and constants;
- :mod:`.costs`: the cost model (verify cost by batch size, the draft's cost per token);
- :mod:`.acceptance`: acceptance estimates by class of situation, pooled and per reply;
- :mod:`.planner`: the draft length with the highest expected rate; when a draft goes on;
- :mod:`.drafter`: :class:`AutoDrafter`, which puts them together behind the drafter interface.
"""

from app.engine.auto.acceptance import Acceptance, lookup_class, model_class
from app.engine.auto.costs import CostModel, MeasuredCosts
from app.engine.auto.drafter import AutoDrafter
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
    "CostModel",
    "MeasuredCosts",
    "Plan",
    "best_length",
    "lookup_class",
    "model_class",
]
