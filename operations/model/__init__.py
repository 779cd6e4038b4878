"""The model: pure data and rules, no pyinfra imports (a test reads every module's imports).

Config loading (``config``, ``server_config``), every validation rule (``validation``; engine flag rules in
``engines/``), engines one module each (``engines/sglang.py``, ``engines/vllm.py``, their data under
``engines/data/``), the desired-vs-reported comparison (``engines.mismatches``), topology and ranks
(``topology``), the idle plan and its verdicts (``idle_plan``), typed readings of the facts' documents (``gpus``,
``server_state``, ``engine_check``), host data read and typed in one place (``hostdata``), template rendering
(``render``).
"""
