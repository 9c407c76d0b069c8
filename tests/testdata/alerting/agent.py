"""A stand-in for the daemon's alerting loop, run as a real process by the kill -9 test.

Usage: python agent.py CONFIG SAMPLES_JSON -- evaluates the samples in the JSON
file ([[name, value, {labels}], ...]) every 100 ms with delivery running, and
prints a line on stdout after each evaluation (so that a test knows it ran).
"""

import json
import sys
import time

from tpuwatch import config as config_module
from tpuwatch import logsetup
from tpuwatch.alerting import Alerting
from tpuwatch.samples import sample

config = config_module.load(sys.argv[1])
logsetup.configure("info")
alerting = Alerting(config, config.state_dir)
alerting.start()
while True:
    with open(sys.argv[2]) as f:
        rows = json.load(f)
    alerting.evaluate([sample(name, value, **labels) for name, value, labels in rows])
    print("evaluated", flush=True)
    time.sleep(0.1)
