"""Loads an LLM inference trace (Azure LLM inference trace CSV format) into requests."""

import csv
import dataclasses
import datetime
import os

# Columns of the Azure trace files (AzurePublicDataset, AzureLLMInferenceTrace_*.csv).
TIMESTAMP_COLUMN = "TIMESTAMP"
CONTEXT_COLUMN = "ContextTokens"
GENERATED_COLUMN = "GeneratedTokens"
_COLUMNS = (TIMESTAMP_COLUMN, CONTEXT_COLUMN, GENERATED_COLUMN)  # those the replay reads


@dataclasses.dataclass(frozen=True)
class TraceRequest:
    """One request of the trace.

    index : row number among the data rows, 0-based.
    arrival_s : arrival time in seconds after the first request of the trace.
    context_tokens : prompt length (the prefill), >= 1.
    generated_tokens : tokens the service generated for it, >= 1.
    """

    index: int
    arrival_s: float
    context_tokens: int
    generated_tokens: int


def parse_timestamp_ns(text: str) -> int:
    """Nanoseconds since the epoch (UTC) of 'YYYY-MM-DD HH:MM:SS[.fraction]'.

    An int, because the trace's seven fractional digits are finer than a float of
    seconds since 1970 resolves (about 2.4e-7 s).

    Raises
    ------
    ValueError
        The text is not in that format.
    """
    try:
        date_text, time_text = text.strip().split(" ")
        whole, _, fraction = time_text.partition(".")
        moment = datetime.datetime.strptime(f"{date_text} {whole}", "%Y-%m-%d %H:%M:%S")
        seconds = int(moment.replace(tzinfo=datetime.timezone.utc).timestamp())
        if fraction and not (fraction.isdigit() and len(fraction) <= 9):
            raise ValueError(fraction)
        return seconds * 10**9 + int(fraction.ljust(9, "0") or 0)
    except ValueError:
        raise ValueError(
            f"trace: {TIMESTAMP_COLUMN} invalid: expected 'YYYY-MM-DD HH:MM:SS.fraction', got {text!r}"
        ) from None


def _positive_int(text: str, column: str, row: int, path: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(
            f"trace: {column} invalid in {path} row {row}: expected a positive integer, got {text!r}"
        )
    return value


def load_trace(path: str, max_requests: int = 0) -> list:
    """Reads the first `max_requests` requests of a trace CSV (all of them when 0).

    Parameters
    ----------
    path : str
        CSV with the columns TIMESTAMP, ContextTokens, GeneratedTokens (others ignored),
        rows in arrival order.
    max_requests : int, default 0
        How many requests to read from the top; 0 reads every row.

    Returns
    -------
    list of TraceRequest, in arrival order, arrival_s relative to the first row.

    Raises
    ------
    ValueError
        Missing or unreadable file, text that is not UTF-8 CSV, a missing column, a row
        too short, a malformed value, timestamps out of order, no rows, or a negative
        max_requests.
    """
    if max_requests < 0:
        raise ValueError(f"trace: max_requests invalid: expected >= 0 (0 reads all), got {max_requests}")
    if not os.path.isfile(path):
        raise ValueError(f"trace: file not found: expected a CSV trace, got {path!r}")
    try:
        return _read_trace(path, max_requests)
    except UnicodeDecodeError as e:
        raise ValueError(f"trace: {path} invalid: expected UTF-8 CSV text, got {e}") from None
    except csv.Error as e:
        raise ValueError(f"trace: {path} invalid: expected CSV, got {e}") from None
    except OSError as e:  # unreadable (permissions, a device that fails)
        raise ValueError(f"trace: {path} unreadable: expected a readable file, got {e}") from None


def _read_trace(path, max_requests):
    requests = []
    first_ns = None
    previous_ns = None
    # utf-8-sig: a CSV saved with a byte-order mark still has its TIMESTAMP column.
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames or []
        for column in _COLUMNS:
            if column not in columns:
                raise ValueError(f"trace: column {column} missing in {path}: expected it among {columns}")
        for row_number, row in enumerate(reader, start=2):  # row 1 is the header
            if max_requests and len(requests) == max_requests:
                break
            missing = [column for column in _COLUMNS if row[column] is None]
            if missing:
                raise ValueError(f"trace: row {row_number} of {path} too short: expected a value for "
                                 f"each of {columns}, got none for {', '.join(missing)}")
            arrival_ns = parse_timestamp_ns(row[TIMESTAMP_COLUMN])
            if previous_ns is not None and arrival_ns < previous_ns:
                raise ValueError(
                    f"trace: {TIMESTAMP_COLUMN} out of order in {path} row {row_number}: "
                    f"expected >= the previous row's, got {row[TIMESTAMP_COLUMN]!r}"
                )
            previous_ns = arrival_ns
            if first_ns is None:
                first_ns = arrival_ns
            requests.append(
                TraceRequest(
                    index=len(requests),
                    arrival_s=(arrival_ns - first_ns) / 1e9,
                    context_tokens=_positive_int(row[CONTEXT_COLUMN], CONTEXT_COLUMN, row_number, path),
                    generated_tokens=_positive_int(row[GENERATED_COLUMN], GENERATED_COLUMN, row_number, path),
                )
            )
    if not requests:
        raise ValueError(f"trace: no requests in {path}: expected at least one data row")
    return requests
