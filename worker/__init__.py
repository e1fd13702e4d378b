"""omnirt.worker: the `omnirt-worker` daemon.

A worker dials the controller (`WorkerGatewayService.Connect`), announces one execution mode
on one backend and runs the assignments it receives. This package stays light: torch and
diffusers are imported only by the modules that run models, when they are first needed.
"""
