"""/metrics read through prometheus_client's parser: sums over label sets, escaped label values,
histograms and a malformed scrape."""

from __future__ import annotations

from quantize_serve.serving.metrics import read_gauges, read_labels

EXPOSITION = r"""# HELP vllm:num_preemptions_total Cumulative number of preemptions.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
vllm:num_preemptions_total{engine="1",model_name="m"} 3.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0"} 5.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="fp8",note="a \"quoted\" } brace"} 1.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="0.3"} 1.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 4.0
vllm:e2e_request_latency_seconds_count 4.0
vllm:e2e_request_latency_seconds_sum 2.5
process_start_time_seconds 1.7e9
"""


def test_gauges_are_summed_over_label_sets() -> None:
    assert read_gauges(
        EXPOSITION,
        [
            "vllm:num_preemptions_total",
            "vllm:num_requests_running",
            "process_start_time_seconds",
            "vllm:num_requests_waiting",
        ],
    ) == {
        "vllm:num_preemptions_total": 5.0,
        "vllm:num_requests_running": 5.0,
        "process_start_time_seconds": 1.7e9,
    }


def test_histogram_samples_are_read_by_their_exposed_names() -> None:
    assert read_gauges(
        EXPOSITION, ["vllm:e2e_request_latency_seconds_count", "vllm:e2e_request_latency_seconds_sum"]
    ) == {"vllm:e2e_request_latency_seconds_count": 4.0, "vllm:e2e_request_latency_seconds_sum": 2.5}


def test_info_labels_keep_escaped_quotes_and_braces() -> None:
    assert read_labels(EXPOSITION, "vllm:cache_config_info") == {
        "block_size": "128",
        "cache_dtype": "fp8",
        "note": 'a "quoted" } brace',
    }
    assert read_labels(EXPOSITION, "vllm:not_exposed") is None


def test_a_malformed_line_keeps_what_came_before() -> None:
    text = 'vllm:num_requests_running{engine="0"} 3.0\nthis is { not a sample\n'
    assert read_gauges(text, ["vllm:num_requests_running"]) == {"vllm:num_requests_running": 3.0}
