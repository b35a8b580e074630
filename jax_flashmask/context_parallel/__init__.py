"""Context parallelism for FlashMask attention (SPEC §4).

* `balance`: chunk workloads from block metadata, `dual_chunk_plan`, `balanced_plan` (host, numpy).
* `layout`: `permute_tokens` / `unpermute_tokens` / `token_positions` (the balanced layout).
* `localize`: zero-communication localization of the global mask to a rank's rows.
* `comm`: static communication schedules (dense or mask-pruned), `needed_chunks`, byte counts.
* `attention`: `context_parallel_attention` (shard_map + all_gather / ppermute, lse merging).
"""

from .attention import context_parallel_attention, local_context_parallel_attention, shard_map
from .balance import (
    PlanReport,
    balanced_plan,
    check_plan,
    chunk_workloads,
    contiguous_plan,
    dual_chunk_plan,
    lower_bound,
    plan_loads,
    tile_workload,
    validate_plan,
)
from .comm import (
    Schedule,
    allgather_volume,
    comm_volume,
    make_schedule,
    needed_chunks,
    pruned_volume,
)
from .layout import inverse_positions, permute_tokens, token_positions, unpermute_tokens
from .localize import bounds_to_indices, chunk_token_index, localize_bounds, localize_rows

__all__ = [
    "context_parallel_attention", "local_context_parallel_attention", "shard_map",
    "PlanReport", "balanced_plan", "check_plan", "chunk_workloads", "contiguous_plan", "dual_chunk_plan",
    "lower_bound", "plan_loads", "tile_workload", "validate_plan",
    "Schedule", "allgather_volume", "comm_volume", "make_schedule", "needed_chunks", "pruned_volume",
    "inverse_positions", "permute_tokens", "token_positions", "unpermute_tokens",
    "bounds_to_indices", "chunk_token_index", "localize_bounds", "localize_rows",
]
