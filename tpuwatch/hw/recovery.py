"""The recovery action an NVIDIA driver asks of a GPU, read from NVML or from the kernel's Xid 154 line.

NVML's ``nvmlDeviceGetFieldValues(h, [NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])`` (field 230, drivers 565 and
later) answers a ``nvmlDeviceGpuRecoveryAction_t`` (nvml.h of nvidia-nvml-dev 13.5.37; the
``NVML_GPU_RECOVERY_ACTION_*`` constants of pynvml.py in nvidia-ml-py 13.615.71); the driver prints each
change as an Xid 154: ``NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to
0x2 (Node Reboot Required)`` (gpud's components/accelerator/nvidia/xid kmsg tests).  Both read into the
same action, named here in the words of the metric label and of the alert.
"""

from __future__ import annotations

import re

RECOVERY_ACTION_FIELD = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
XID_RECOVERY_ACTION = 154

# nvmlDeviceGpuRecoveryAction_t -> the ``action`` label.
ACTIONS = {0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p", 4: "drain_and_reset",
           5: "recover_imex_domain", 6: "bus_reset", 7: "system_reboot"}
_SENTENCE = {0: "none", 1: "GPU reset", 2: "node reboot", 3: "drain P2P", 4: "drain and reset",
             5: "recover IMEX domain", 6: "bus reset", 7: "system reboot"}
# Actions that take the GPU out of service until someone resets it or reboots: critical.
DISRUPTIVE = frozenset({1, 2, 4, 6, 7})

# The driver's own words in an Xid 154 line without the hex code (older drivers print only the action).
# "PF FLR" and "OS Reboot" (610 drivers) are read as the bus reset and the system reboot they name
# (unverified: no public line pairs them with their code).
WORDS = {"None": 0, "GPU Reset Required": 1, "Node Reboot Required": 2, "Drain P2P": 3, "Drain and Reset": 4,
         "Drain and Reset Required": 4, "Recover IMEX Domain": 5, "PF FLR": 6, "OS Reboot": 7}
_CHANGED = re.compile(r"\brecovery action changed from 0x[0-9a-fA-F]{1,8}\b.*?\bto 0x(?P<code>[0-9a-fA-F]{1,8})\b")
_ENDING = re.compile(r"\b(?P<words>" + "|".join(sorted(map(re.escape, WORDS), key=len, reverse=True))
                     + r")\)?\.?\s*$")


def action_name(code: int) -> str:
    """The label of an action: its name, or a newer one's number (``"8"``)."""
    return ACTIONS.get(code, str(code))


def action_words(code: int) -> str:
    """The action in words for a sentence: "node reboot", "recover IMEX domain", "action 8"."""
    return _SENTENCE.get(code, f"action {code}")


def is_disruptive(code: int) -> bool:
    """Whether the action takes the GPU out of service (a reset or a reboot)."""
    return code in DISRUPTIVE


def xid154_action(message: str) -> int | None:
    """The action an Xid 154 line says the GPU now needs (the ``to 0xN`` code, else its words); None if none."""
    found = _CHANGED.search(message)
    if found is not None:
        return int(found.group("code"), 16)
    ending = _ENDING.search(message)
    return WORDS[ending.group("words")] if ending is not None else None
