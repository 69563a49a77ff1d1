"""Spark's errors as one line (no plan, no JVM frames): shared by the pipeline-file
checks and the real-time adapter, which import nothing of each other."""

from __future__ import annotations

import re

_ERROR_CLASS = re.compile(r"^\[(?P<cls>[A-Z0-9_.]+)\]\s*")
_POSITION = re.compile(r"\(line (\d+), pos (\d+)\)|line (\d+),? pos (\d+)")
_SQLSTATE = re.compile(r"\s*SQLSTATE: \w+[;.]?")


def spark_message(exc: BaseException) -> str:
    """The first meaningful line of a Spark error: no plan, no JVM frames, no SQLSTATE."""
    text = str(exc)
    java = text.find("\n: ")  # Py4JJavaError: "An error occurred while calling ...\n: <exc>"
    if text.startswith("An error occurred while calling") and java >= 0:
        text = text[java + 3:]
        text = re.sub(r"^[\w.$]+(Exception|Error): ", "", text)
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    first = lines[0] if lines else type(exc).__name__
    position = _POSITION.search(text)
    first = _SQLSTATE.sub("", first)
    first = _ERROR_CLASS.sub("", first).strip().rstrip(";")
    first = re.sub(r"\.?\s*\(?line \d+,? pos \d+\)?$", "", first).rstrip(" .")
    if position:
        line, pos = (position.group(1), position.group(2)) if position.group(1) else (
            position.group(3), position.group(4))
        first += f" (line {line}, pos {pos})"
    return first


def _is_spark_error(exc: Exception) -> bool:
    module = type(exc).__module__
    return module.startswith(("pyspark.", "py4j."))


_TXSINK_ERROR = re.compile(r"txsink\.(?:[a-z_]+\.)*(?P<kind>[A-Z]\w+): (?P<message>.+)")


_PYTHON_ERROR = re.compile(r"^(?:[a-z_]\w*\.)*(?P<kind>[A-Z]\w*(?:Error|Exception|Fault)): "
                           r"(?P<message>.+)")


def first_lines(text: str) -> str:
    """The txsink error inside a Spark/Python traceback, else the Python error at the
    bottom of it, else Spark's first line."""
    found = _TXSINK_ERROR.search(text)
    if found:
        return f"{found['kind']}: {found['message'].strip()}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    python = [m for m in map(_PYTHON_ERROR.match, lines) if m]
    if python:
        return f"{python[-1]['kind']}: {python[-1]['message'].strip()}"
    lines = [ln for ln in lines
             if not ln.startswith(("at ", "File ", "Traceback", "==", "+-"))]
    return spark_message(Exception(lines[0] if lines else text))
