"""Tuning: the thresholds a server runs with, computed, written, planned and exported.

- ``autotune``: the server-start hook and the thresholds-table computation (``on_server_start``, ``tune``) and the
  one writer of thresholds files (``write_thresholds``, which validates a document by the reader before it
  writes it atomically; ``write_sweep`` for a finished sweep, ``tr-optimize --thresholds``);
- ``launch_policy``: the compact state-dependent launch-policy classes a thresholds file may carry;
- ``export``: a thresholds file as the launch arguments of a serving system (R2R);
- ``kvplan``: the joint KV-cache plan of co-located models.

The thresholds *format* belongs to this room too, but its reader stays at the stable path ``tr_model/thresholds.py``:
one standard-library file that runtimes vendor (it imports nothing, not even this package).

May import: the standard library, ``tr_core``, the features (``dtmc``, ``optimizer``, ``simulator``) and
``tr_model.thresholds``; never the public API module, the command lines (``tr_model.cli``, ``autotune_cli``,
``plan_cli``) or ``tr_model.serving`` (``tests/test_api_rooms.py``).
"""
