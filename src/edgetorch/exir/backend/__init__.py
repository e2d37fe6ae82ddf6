"""Delegation: partitioners choose nodes, backends ``preprocess`` them, ``to_backend`` swaps in delegate calls."""

from edgetorch.exir.backend.backend_details import (
    BackendDetails,
    PreprocessResult,
    get_backend_details,
    register_backend_details,
)
from edgetorch.exir.backend.delegation_info import DelegationInfo, get_delegation_info
from edgetorch.exir.backend.lowered import CALL_DELEGATE, LoweredBackendModule, delegate_calls, lowered_module_of
from edgetorch.exir.backend.partitioner import (
    DELEGATION_TAG,
    CompileSpec,
    DelegationSpec,
    Partitioner,
    PartitionResult,
)

__all__ = [
    "CALL_DELEGATE",
    "DELEGATION_TAG",
    "BackendDetails",
    "CompileSpec",
    "DelegationInfo",
    "DelegationSpec",
    "LoweredBackendModule",
    "PartitionResult",
    "Partitioner",
    "PreprocessResult",
    "get_backend_details",
    "delegate_calls",
    "get_delegation_info",
    "lowered_module_of",
    "register_backend_details",
]
