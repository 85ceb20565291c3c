/* loom's version (printed by `loom version`, recorded in checkpoints). */
#ifndef LOOM_CORE_VERSION_H
#define LOOM_CORE_VERSION_H

#define LOOM_VERSION "0.1.0"

#endif
