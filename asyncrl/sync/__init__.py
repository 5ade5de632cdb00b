"""Weight sync from the trainer to the rollout engines: synchronizer, transports, both halves.

`ParameterSynchronizer(trainer, rollouts, transport)` drives a sync through worker handles;
`TrainerWeights` / `RolloutWeights` (or the functions they use: `send_weights`, `recv_weights`,
and `asyncrl.models.tensors`' `export_named`, `checksum`, ... with `asyncrl.models.weights`'
`load_into`) are what the worker objects call on their side.
Importing this package does not import Ray.
"""

from asyncrl.sync.buckets import (
                                  DEFAULT_BUCKET_MB,
                                  BroadcastReceiver,
                                  BroadcastSender,
                                  plan_buckets,
                                  recv_weights,
                                  send_weights,
)
from asyncrl.sync.collective import Collective, destroy_collective, get_collective, init_collective
from asyncrl.sync.endpoints import RolloutWeights, TrainerWeights
from asyncrl.sync.synchronizer import ParameterSynchronizer
from asyncrl.sync.transports import TRANSPORTS, default_transport, make_transport

__all__ = [
    "DEFAULT_BUCKET_MB", "TRANSPORTS", "BroadcastReceiver", "BroadcastSender", "Collective",
    "ParameterSynchronizer", "RolloutWeights", "TrainerWeights", "default_transport", "destroy_collective",
    "get_collective", "init_collective", "make_transport", "plan_buckets", "recv_weights", "send_weights",
]
