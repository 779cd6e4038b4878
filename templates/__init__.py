# jinja2 templates; installed as the package data of operations.templates (see pyproject.toml)
