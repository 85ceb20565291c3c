/* The training run's instrumentation as the step's observers (train/step_observer.h). */
#ifndef LOOM_TRAIN_OBSERVERS_H
#define LOOM_TRAIN_OBSERVERS_H

#include "train/run.h"
#include "train/step_observer.h"

/* Registers, in this order: fault injection (core/fault.h), the progress record the
 * heartbeats read (core/progress.h), the trace's spans (--trace), the start-up timeline's
 * marks and line (core/timeline.h), the reference dumps (--dump-dir, train/dump.h), and
 * the step's report (--metrics, --tensorboard, the progress line on rank 0). */
void loom_train_observers_init(loom_step_observers *o, loom_run *r);

#endif
