"""Train jobs on Kubernetes: a batch/v1 Job per promoted train job, followed by a watch.

`job_spec.TrainJobSpec` is what a job needs; `objects` builds the Job and its checkpoint
claim as pure functions; `status` maps a Job and its pods to gpupool's job states;
`controller.KubeJobController` creates Jobs through kubernetes_asyncio and watches them;
`kueue` renders the optional Kueue queues.

`TrainJobSpec` is imported lazily: the chart's uninstall step (`usage_finalizer`) runs in the
node agent's small image, which has gpupool without the hub's dependencies.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpupool.kube.job_spec import TrainJobSpec

__all__ = ["TrainJobSpec"]


def __getattr__(name: str) -> object:
    if name == "TrainJobSpec":
        from gpupool.kube.job_spec import TrainJobSpec

        return TrainJobSpec
    raise AttributeError(name)
