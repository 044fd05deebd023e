#pragma once
#define DL_VERSION_MAJOR 0
#define DL_VERSION_MINOR 1
#define DL_VERSION_PATCH 0
#define DL_VERSION_STRING "0.1.0"
