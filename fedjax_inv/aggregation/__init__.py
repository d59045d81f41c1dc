"""Server-side aggregation: the mean, geometric and sign-agreement rules and FedGMA's masked
step (``aggregators``), and the Byzantine-robust rules (``robust``: median, trimmed mean,
Krum, geometric median, centered clipping, bucketing). The engine's associative
client-axis reduction they build on is ``fedjax_inv.core.aggregator``. Client-level DP's
clipped mean is here too (``aggregators.clipped_mean``); its noise and accountant are in
``fedjax_inv.privacy.client_dp``.
"""
