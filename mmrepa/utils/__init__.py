from .complexity import complexity, model_complexity, sdpa_macs
from .latency import LatencyStats, time_call, time_interleaved

__all__ = [
    'complexity',
    'model_complexity',
    'sdpa_macs',
    'LatencyStats',
    'time_call',
    'time_interleaved',
]
