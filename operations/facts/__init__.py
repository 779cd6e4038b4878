"""pyinfra facts, each returning a JSON document: ``gpu.Gpus``, ``server.Server``, ``engine.EngineParse``."""
