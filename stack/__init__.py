"""The local stack as Python: the service processes, their health and the cleanup of what they
created (harness.py), and the command behind stack/services.sh (services.py).

The tests (with tests/inprocess.py for the services served inside the test process), the benches
(bench/common.py) and stack/services.sh all use it; it imports services/ and nothing from tests/ or
bench/.
"""
