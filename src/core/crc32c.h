/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of iSCSI, ext4 and
 * TensorFlow's record files. crc32c("123456789") = 0xE3069283. */
#ifndef LOOM_CORE_CRC32C_H
#define LOOM_CORE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends crc (0 to start) with n bytes: loom_crc32c(loom_crc32c(0, a, n), b, m) equals the
 * CRC of a followed by b. */
uint32_t loom_crc32c(uint32_t crc, const void *data, size_t n);

#endif
