"""Server-side aggregation: the mean, geometric and sign-agreement rules and FedGMA's masked
step (``aggregators``), and the Byzantine-robust rules (``robust``: median, trimmed mean,
Krum, geometric median, centered clipping, bucketing). The engine's associative
client-axis reduction they build on is ``fedjax_inv.core.aggregator``; client-level DP's
clipped mean is in ``fedjax_inv.privacy.client_dp``.
"""
