"""Training loop shared by every task, alone or in several processes."""
from pyg_metric_attn.training.device import (
    PRECISIONS,
    DeviceUnavailableError,
    Placement,
    resolve_device,
)
from pyg_metric_attn.training.distributed import (
    CollectiveError,
    DistributedContext,
    process_group,
    shard_indices,
    strided_share,
    unwrap,
)
from pyg_metric_attn.training.eval_mode import eval_mode
from pyg_metric_attn.training.schedules import WarmupCosine, warmup_cosine
from pyg_metric_attn.training.seeds import epoch_generator
from pyg_metric_attn.training.trainer import (
    Trainer,
    best_checkpoint,
    load_best_model,
    load_checkpoint,
    seed_everything,
)

__all__ = ['PRECISIONS', 'CollectiveError', 'DeviceUnavailableError',
           'DistributedContext', 'Placement', 'Trainer', 'WarmupCosine',
           'best_checkpoint', 'epoch_generator', 'eval_mode', 'load_best_model',
           'load_checkpoint',
           'process_group',
           'resolve_device', 'seed_everything', 'shard_indices',
           'strided_share', 'unwrap', 'warmup_cosine']
