/* Small filesystem helpers shared by the commands. */
#ifndef LOOM_CORE_FS_H
#define LOOM_CORE_FS_H

/* The longest path a flag or a folder name holds (train_config.h, ckpt/ckpt_peer.h). */
#define LOOM_PATH_MAX 1024

/* mkdir -p: creates every missing component of dir; 0 or -1 with errno set. */
int loom_mkdir_p(const char *dir);
/* Creates the folder that will hold `path` (everything before its last '/'). */
int loom_mkdir_parent(const char *path);

#endif
