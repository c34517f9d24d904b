"""File and wire formats of the model: the HdrHistogram V2 codec (hdr) and iotrace's JSONL (jsonl)."""
