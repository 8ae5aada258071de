from .latency import LatencyStats, time_call, time_interleaved

__all__ = ['LatencyStats', 'time_call', 'time_interleaved']
