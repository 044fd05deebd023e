#pragma once
// dl's parameter server for large sparse embedding tables (link dl::ps; needs Boost.Asio):
//   dl::ps::service  tables sharded over threads, server-side optimizers (service.hpp)
//   dl::ps::server   the service over TCP (server.hpp; examples/ps_server is a ready process)
//   dl::ps::client   async pull/push, embedded or over TCP to a cluster (client.hpp)
#include "dist/ps/client.hpp"
#include "dist/ps/protocol.hpp"
#include "dist/ps/server.hpp"
#include "dist/ps/service.hpp"
#include "dist/ps/table.hpp"
