"""The built-in `python` environment: every attack on the sandbox is answered with an error and the episode goes on."""

import pytest

from kuberl.runtime.environments import EnvironmentSettings, ModelTurn, Role
from kuberl.runtime.environments.python import PythonEnvironment
from kuberl.runtime.environments.tool_formats import TaggedFormat

pytestmark = pytest.mark.integration

ATTACKS = {
    "an infinite loop": ("while True:\n    pass", "stopped: the code"),
    "a fork bomb": ("import os\nwhile True:\n    os.fork()", "BlockingIOError"),
    "a memory hog": ("hog = bytearray(2 * 1024**3)", "MemoryError: the code may use at most 128 MiB"),
    "a network attempt": ("import socket\nsocket.create_connection(('1.1.1.1', 443))", "Network is unreachable"),
    "a write outside the scratch folder": ("open('/usr/lib/owned', 'w').write('x')", "Read-only file system"),
}


def test_each_attack_is_an_error_observation_and_the_episode_goes_on() -> None:
    environment = PythonEnvironment({}, EnvironmentSettings(max_turns=8, tool_timeout_seconds=3, tool_memory_mib=128))
    tagged = TaggedFormat({"python": "code"})
    for attack, (code, phrase) in ATTACKS.items():
        observation = environment.step(tagged.read(f"<python>{code}</python>"))
        assert not observation.done, attack
        (message,) = observation.messages
        assert message.role == Role.ERROR and phrase in message.text, (attack, message.text)
        assert observation.metrics == {"tool_calls": 1.0, "tool_errors": 1.0}
    answer = environment.step(tagged.read("<python>37 * 48</python>"))
    assert answer.messages[0].role == Role.TOOL and answer.messages[0].text == "1776"
    assert environment.step(ModelTurn(" 1776")).done
