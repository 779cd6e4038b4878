"""The baseline for bench/cluster_bench.py: a bare pyinfra deploy doing one command per host."""
from pyinfra.operations import server

server.shell(name="bare: true", commands=["true"])
