"""Node-local Engram rows: safetensors headers, harvested row ranges, manifests and the fleet copy."""
