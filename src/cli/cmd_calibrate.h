/* loom calibrate: measures this machine through loom's own kernels (the backend table),
 * optimizer and communication API, and writes a machine profile (docs/PROFILE.md) that
 * plan/profile.h reads. The MPI part runs under mpirun, launched by the command itself
 * (one `mpirun -n G loom calibrate --comm-worker` per group size). --validate FILE loads
 * a profile with the reader and prints a few of its lookups. */
#ifndef LOOM_CLI_CMD_CALIBRATE_H
#define LOOM_CLI_CMD_CALIBRATE_H

int loom_cmd_calibrate(int argc, char **argv);

#endif
