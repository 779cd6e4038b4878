"""specops: pyinfra operations and facts that converge GPU inference hosts to declared states.

Import the domain modules from deploy files: ``from operations import gpu``.
"""
