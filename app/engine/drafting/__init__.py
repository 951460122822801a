"""Drafters behind one interface (:mod:`.base`): the draft model, prompt lookup, and auto mode's choice
between them (:mod:`app.engine.auto`)."""

from app.engine.drafting.base import EMPTY, Drafter, Outcome, Proposal, common_prefix
from app.engine.drafting.lookup import LookupDrafter
from app.engine.drafting.model import ModelDrafter

__all__ = ["EMPTY", "Drafter", "LookupDrafter", "ModelDrafter", "Outcome", "Proposal", "common_prefix"]
# MtpDrafter (drafting.mtp) is imported where it is used: it needs llama_cpp's experimental bindings
