"""Process memory for ``fedjax-inv bench``: the resident set size now and its peak
(Linux ``/proc/self/status``: ``VmRSS``, ``VmHWM``; the peak can be reset through
``/proc/self/clear_refs``), from which a row's ``rss_peak_delta_mb`` is measured."""
from __future__ import annotations


def _proc_status(field: str) -> int | None:
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith(field + ":"):
          return int(line.split()[1]) * 1024
  except OSError:
    return None
  return None


def rss_bytes() -> int | None:
  """Current resident set size of this process (Linux ``VmRSS``), or None."""
  return _proc_status("VmRSS")


def reset_peak_rss() -> bool:
  """Resets the process's peak RSS (``VmHWM``) via ``/proc/self/clear_refs``; False when
  the OS does not allow it (then the peak is the process-lifetime peak)."""
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
    return True
  except OSError:
    return False


def peak_rss_bytes() -> int | None:
  """Peak resident set size since the last :func:`reset_peak_rss` (``VmHWM``), else
  ``ru_maxrss``."""
  v = _proc_status("VmHWM")
  if v is not None:
    return v
  try:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  except (ImportError, OSError):
    return None
