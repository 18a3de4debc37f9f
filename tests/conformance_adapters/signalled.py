"""An adapter during whose evaluate a real SIGINT arrives (it sends one to its own process): the run is
interrupted by the signal, not ended by an adapter error."""
import os
import signal
import time


def evaluate(model, inputs):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(10)
    raise AssertionError("SIGINT did not arrive")
