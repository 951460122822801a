"""The inference engine: speculative decoding over llama.cpp, in its own process. Never imports Qt.

This module is the engine's public API for the UI, the CLI and the server: the client of the engine
process, the settings it takes, the records it streams and the errors it raises. Importing it does not
load llama.cpp (that happens in the engine process).
"""

from app.engine.errors import (
    ConstraintError,
    ContextFullError,
    EngineError,
    IncompatibleDraftError,
    LlamaError,
    ModelLoadError,
    PromptTooLongError,
)
from app.engine.events import (
    Action,
    Decision,
    Declined,
    Finished,
    FinishReason,
    Mode,
    Policy,
    Source,
    Started,
    Stats,
    Step,
)
from app.engine.info import Device, EngineInfo, EngineStatus, HistoryInfo, ModelInfo, Offload
from app.engine.process.client import EngineClient, GenerationStream
from app.engine.process.errors import EngineCrashedError, RemoteError
from app.engine.process.turns import QueueFull, Ticket, TurnQueue
from app.engine.sampling import SamplingError, SamplingParams
from app.engine.settings import MODES, Constraint, GenerationSettings, LoadSettings, parse_gpu_layers
from app.gguf.arch import MemoryKind, Rollback

__all__ = [
    "MODES",
    "Action",
    "Constraint",
    "ConstraintError",
    "ContextFullError",
    "Decision",
    "Declined",
    "Device",
    "EngineClient",
    "EngineCrashedError",
    "EngineError",
    "EngineInfo",
    "EngineStatus",
    "FinishReason",
    "Finished",
    "GenerationSettings",
    "GenerationStream",
    "HistoryInfo",
    "IncompatibleDraftError",
    "LlamaError",
    "LoadSettings",
    "MemoryKind",
    "Mode",
    "ModelInfo",
    "ModelLoadError",
    "Offload",
    "Policy",
    "PromptTooLongError",
    "QueueFull",
    "RemoteError",
    "Rollback",
    "SamplingError",
    "SamplingParams",
    "Source",
    "Started",
    "Stats",
    "Step",
    "Ticket",
    "TurnQueue",
    "parse_gpu_layers",
]
