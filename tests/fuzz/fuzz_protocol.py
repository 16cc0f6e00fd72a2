"""Coverage-guided fuzzing (atheris) of what the collector does with a client's bytes
before any privileged action: decoding a datagram and validating a hello.

    python tests/fuzz/fuzz_protocol.py -runs=100000
Any exception but ProtocolError is a finding (atheris exits non-zero with the input).
"""

import sys

import atheris

with atheris.instrument_imports():
    from otel_gil_collector.server import parse_hello
    from otel_gil import protocol


def one_input(data: bytes) -> None:
    try:
        parse_hello(protocol.decode(data))
    except protocol.ProtocolError:
        pass


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
