"""Tests of the trace loader, on the repository's copy of the Azure trace and on small files."""

import os
import sys

import pytest

from tools.replay import trace

AZURE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                     "data", "azure_llm_inference_2023", "conv.csv")


def _write(tmp_path, text):
    path = tmp_path / "t.csv"
    path.write_text(text)
    return str(path)


def test_azure_first_rows():
    requests = trace.load_trace(AZURE, max_requests=3)
    assert [(r.index, r.context_tokens, r.generated_tokens) for r in requests] == [
        (0, 374, 44), (1, 396, 109), (2, 879, 55)]
    assert requests[0].arrival_s == 0.0
    # 18:15:50.9951690 - 18:15:46.6805900
    assert requests[1].arrival_s == pytest.approx(4.314579, abs=1e-9)
    assert requests[2].arrival_s == pytest.approx(4.541877, abs=1e-9)


def test_azure_whole_trace():
    requests = trace.load_trace(AZURE, max_requests=0)
    assert len(requests) == 19366
    assert sum(r.context_tokens for r in requests) == 22361870
    assert sum(r.generated_tokens for r in requests) == 4088665
    assert requests[-1].arrival_s == pytest.approx(3501.721937, abs=1e-5)
    assert len(trace.load_trace(AZURE, max_requests=200)) == 200


def test_parse_timestamp_keeps_seven_digits():
    a = trace.parse_timestamp_ns("2023-11-16 18:15:46.6805900")
    assert trace.parse_timestamp_ns("2023-11-16 18:15:46.6805901") - a == 100
    assert a == 1700158546680590000
    assert (trace.parse_timestamp_ns("2023-11-17 00:00:00")
            - trace.parse_timestamp_ns("2023-11-16 23:59:59.5")) == 500_000_000


def test_other_columns_ignored(tmp_path):
    path = _write(tmp_path, "Extra,TIMESTAMP,GeneratedTokens,ContextTokens\n"
                            "x,2023-11-16 18:00:00.25,7,11\nx,2023-11-16 18:00:01,3,5\n")
    requests = trace.load_trace(path)
    assert [(r.arrival_s, r.context_tokens, r.generated_tokens) for r in requests] == [
        (0.0, 11, 7), (0.75, 5, 3)]


@pytest.mark.parametrize("text, message", [
    ("TIMESTAMP,ContextTokens\n", "trace: column GeneratedTokens missing"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "trace: no requests"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,0,5\n",
     "trace: ContextTokens invalid in .* row 2: expected a positive integer, got '0'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,4,x\n",
     "trace: GeneratedTokens invalid in .* row 2: expected a positive integer, got 'x'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n18:00:00,4,5\n", "trace: TIMESTAMP invalid"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:01,4,5\n2023-11-16 18:00:00,4,5\n",
     "trace: TIMESTAMP out of order in .* row 3"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,4\n",
     "trace: row 2 of .* too short: expected a value for each of .*, got none for GeneratedTokens"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,4,\"" + "5" * 200000 + "\"\n",
     "trace: .* invalid: expected CSV, got field larger than field limit"),
])
def test_bad_files(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        trace.load_trace(_write(tmp_path, text))


def test_byte_order_mark_and_binary(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbfTIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,4,5\n")
    assert [(r.context_tokens, r.generated_tokens) for r in trace.load_trace(str(path))] == [(4, 5)]
    path.write_bytes(b"\xba\xff\x00 not text")
    with pytest.raises(ValueError, match="trace: .* invalid: expected UTF-8 CSV text"):
        trace.load_trace(str(path))


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="trace: file not found"):
        trace.load_trace(str(tmp_path / "missing.csv"))
    with pytest.raises(ValueError, match="max_requests invalid: expected >= 0 .*got -1"):
        trace.load_trace(AZURE, max_requests=-1)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
