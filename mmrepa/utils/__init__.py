from .complexity import complexity, sdpa_macs
from .latency import LatencyStats, time_call, time_interleaved

__all__ = ['complexity', 'sdpa_macs', 'LatencyStats', 'time_call', 'time_interleaved']
