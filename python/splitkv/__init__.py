"""splitkv: paged-KV and ragged attention with split-KV merged inside one launch.

Several workers share one sequence's KV; the last to finish, found with an atomic
counter in a caller-owned :class:`Workspace`, merges the partial results and puts the
counter back to zero, so the workspace is zeroed once, when it is made, and never again.

Operations: :func:`paged_attention`, :func:`ragged_attention`; :func:`merge_states` merges
partial results over disjoint key sets by their LSE; :mod:`splitkv.distributed` shards each
request's keys over the ranks of a torch.distributed group (context parallelism). Their
plans (split count, workspace layout) without running: :func:`plan_paged_attention`,
:func:`plan_ragged_attention`. Per layer with a step's index tensors, workspace and options
bound once (host time): :class:`PagedAttentionRunner`, :class:`RaggedAttentionRunner`.
Workspace: :class:`Workspace`,
:func:`required_workspace_bytes`, :func:`workspace_layout`, :func:`check_counter_region`,
:func:`check_workspace` (a dirty counter found by a CUDA launch; the README's "The
workspace contract"),
:func:`reset_counter_region`, :func:`fp8_prefill_workspace_bytes` (the workspace an fp8
prefill needs for its 16-bit copy). :func:`cuda_backend_available`: whether this build has
the CUDA kernels.
Inside torch.compile(fullgraph=True) or CUDA graphs: :mod:`splitkv.ops` (the same
operations as torch.library custom ops ``torch.ops.splitkv.*``).
"""

# The wheel's version (python/BUILD names the wheel file with the same string).
__version__ = "0.1.0"

from splitkv import _splitkv
from splitkv import distributed
from splitkv import ops
from splitkv.attention import Plan
from splitkv.attention import paged_attention
from splitkv.attention import plan_paged_attention
from splitkv.attention import plan_ragged_attention
from splitkv.attention import ragged_attention
from splitkv.merge import merge_states
from splitkv.runners import PagedAttentionRunner
from splitkv.runners import RaggedAttentionRunner
from splitkv.workspace import COUNTER_REGION_BYTES
from splitkv.workspace import WORKSPACE_ALIGNMENT
from splitkv.workspace import Workspace
from splitkv.workspace import WorkspaceLayout
from splitkv.workspace import check_counter_region
from splitkv.workspace import check_workspace
from splitkv.workspace import fp8_prefill_workspace_bytes
from splitkv.workspace import required_workspace_bytes
from splitkv.workspace import reset_counter_region
from splitkv.workspace import workspace_layout


def cuda_backend_available():
    """True when this build of splitkv has the CUDA backend (built with --config=cuda)."""
    return _splitkv.CudaBackendAvailable()


__all__ = [
    "COUNTER_REGION_BYTES",
    "PagedAttentionRunner",
    "Plan",
    "RaggedAttentionRunner",
    "WORKSPACE_ALIGNMENT",
    "Workspace",
    "WorkspaceLayout",
    "check_counter_region",
    "check_workspace",
    "cuda_backend_available",
    "distributed",
    "fp8_prefill_workspace_bytes",
    "merge_states",
    "ops",
    "paged_attention",
    "plan_paged_attention",
    "plan_ragged_attention",
    "ragged_attention",
    "required_workspace_bytes",
    "reset_counter_region",
    "workspace_layout",
]
