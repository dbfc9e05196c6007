"""The reward-design loop: configuration, run directory, stages, report (host-side orchestration)."""

from jaxrace.design.config import DEFAULT_TASK, PRESETS, DesignConfig, load_config
from jaxrace.design.loop import run_design
from jaxrace.design.report import write_report
from jaxrace.design.rundir import ConfigMismatch, RunDir

__all__ = ["DEFAULT_TASK", "PRESETS", "ConfigMismatch", "DesignConfig", "RunDir", "load_config", "run_design",
           "write_report"]
