_instruments: tuple[str, ...] = ()  # otel_gil instruments the interpreter, not a library
