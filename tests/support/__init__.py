"""What the tests share, one module per job: starting the real stack (``stack.py``) or the
app in process (``inprocess.py``), waiting (``waiting.py``), request bodies and what comes
back (``bodies.py``), Realtime sockets (``realtime.py``), audio (``audio.py``), Triton's
configs and tensors (``triton.py``)... A test module imports its helpers from here, never
from another test module or a conftest (``tests/unit/test_suite_layout.py`` checks);
conftest files hold fixtures only."""
