"""Generated from proto/omnirt/worker/v1; do not edit (scripts/gen_proto.py)."""
