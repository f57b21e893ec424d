"""The declarative spec: inventory, profiles (lanes) and playbooks, validated at the boundary."""
