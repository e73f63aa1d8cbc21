"""Errors a user can fix: the CLI prints them as one line and exits with status 2."""

from specheads.config import ConfigError
from specheads.data.sources import DataError
from specheads.drafters import DrafterError
from specheads.evaluation.suite import SuiteError
from specheads.heads.format import HeadFormatError
from specheads.heads.registry import HeadKindError
from specheads.hub import HubError
from specheads.kernels.tuning import TuningError
from specheads.runtime.engine import EngineError
from specheads.runtime.sampling import InvalidRequest
from specheads.target.model import UnsupportedTargetError
from specheads.training.data import PreparedDataError
from specheads.training.trainer import TrainingError

USER_ERRORS = (
    ConfigError,
    DataError,
    DrafterError,
    SuiteError,
    HeadFormatError,
    HeadKindError,
    HubError,
    EngineError,
    InvalidRequest,
    TuningError,
    UnsupportedTargetError,
    PreparedDataError,
    TrainingError,
    FileNotFoundError,
)
