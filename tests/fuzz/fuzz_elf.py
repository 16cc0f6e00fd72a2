"""Coverage-guided fuzzing (atheris) of the ELF reader: the collector, as root, parses
binaries from any container on the host, so hostile files must only ever yield
ElfLookupError.

    python tests/fuzz/fuzz_elf.py -runs=100000 [corpus dir]
"""

import sys

import atheris

with atheris.instrument_imports():
    from otel_gil_collector import elf


def one_input(data: bytes) -> None:
    try:
        elf._parse(data)
    except elf.ElfLookupError:
        pass


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
