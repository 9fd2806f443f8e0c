// Cosimulation top of one NME: HDL clock, rank-local memory with latency and pseudo-random
// stalls, a command feeder and a job controller, so that a whole program runs with no
// Python per clock (see docs/design.md, Cosimulation).
//
// The memory's words live in the file +MEM_SHM, which the host maps too (cosim/shared_mem.py,
// DPI-C side cosim/shared_mem.cpp): the host writes and reads them directly, nothing is
// loaded or dumped through the HDL; the file also lists the words written since a job began.
//
// cocotb drives the job port (tb_* inputs, marked public) and waits for tb_ack to change:
//   OP_LOAD  : acknowledge (the host has written the memory: a clock edge passes)
//   OP_CLEAR : zero the whole memory
//   OP_RUN   : $readmemh(+CMD_IN) into the command buffer, empty the written-words list,
//              stream tb_ncmd words into the NME, wait for `done`, latch status / l1 /
//              cycles / toggles and the number of words written (tb_ndirty)
//   OP_DUMP  : acknowledge (the host reads the memory)
// A reset (tb_rst) aborts a running job (tb_aborted); the memory is not reset: reads in flight
// are still answered, as a real memory would.
`timescale 1ns/1ps

`ifndef NME_MODULE
`define NME_MODULE coda_nme
`endif

module nme_tb_top #(
    parameter int LANES = 8,
    parameter int MEM_WORDS = 65536,
    parameter int RSP_DEPTH = 512,     // read responses the memory can hold in flight
    parameter int CMD_DEPTH = 512,     // command words of one job (a program is <= 256)
    parameter int TOG_W = 64           // width of the NME's dbg_fu_toggles, when it has one
);
    localparam int WB = 16 * LANES;
    localparam int RSP_AW = $clog2(RSP_DEPTH);
    localparam logic [2:0] OP_LOAD = 3'd1, OP_CLEAR = 3'd2, OP_RUN = 3'd3, OP_DUMP = 3'd4;

    // ---------------------------------------------------------------- clock and reset
    logic clk = 1'b0;
    initial forever #5 clk = ~clk;     // 10 ns period: cycles = sim time / 10 ns

    logic       tb_rst /*verilator public_flat_rw*/ = 1'b0;
    logic [2:0] por_count = 3'd4;      // power-on reset for the first cycles
    wire        rst = tb_rst || (por_count != 0);
    always @(posedge clk) if (por_count != 0) por_count <= por_count - 3'd1;

    // ---------------------------------------------------------------- job port (cocotb)
    logic [31:0] tb_req /*verilator public_flat_rw*/ = 32'd0;   // a change starts a job
    logic [2:0]  tb_op /*verilator public_flat_rw*/ = 3'd0;
    logic [15:0] tb_ncmd /*verilator public_flat_rw*/ = 16'd0;
    logic [31:0] tb_seed /*verilator public_flat_rw*/ = 32'd1;
    logic [15:0] tb_req_stall /*verilator public_flat_rw*/ = 16'd0;  // P(stall) * 65536
    logic [15:0] tb_rsp_stall /*verilator public_flat_rw*/ = 16'd0;
    logic [7:0]  tb_latency /*verilator public_flat_rw*/ = 8'd1;     // cycles, >= 1
    logic [31:0] tb_max_cycles /*verilator public_flat_rw*/ = 32'd1000000;

    logic [31:0] tb_ack /*verilator public_flat_rw*/ = 32'd0;   // = tb_req when the job ended
    logic [2:0]  tb_status /*verilator public_flat_rw*/ = 3'd0;
    logic [31:0] tb_l1 /*verilator public_flat_rw*/ = 32'd0;
    logic [31:0] tb_cycles /*verilator public_flat_rw*/ = 32'd0;
    logic [63:0] tb_toggles /*verilator public_flat_rw*/ = 64'd0;
    logic        tb_timeout /*verilator public_flat_rw*/ = 1'b0;
    logic        tb_aborted /*verilator public_flat_rw*/ = 1'b0;
    logic [31:0] tb_ndirty /*verilator public_flat_rw*/ = 32'd0;
    logic [15:0] tb_cmd_left /*verilator public_flat_rw*/ = 16'd0;  // words not taken at done
    logic [31:0] tb_rsp_left /*verilator public_flat_rw*/ = 32'd0;  // responses owed at done
    logic [31:0] tb_oob /*verilator public_flat_rw*/ = 32'd0;      // requests past MEM_WORDS
    logic [31:0] tb_overflow /*verilator public_flat_rw*/ = 32'd0; // reads beyond RSP_DEPTH
    logic [31:0] tb_stray_done /*verilator public_flat_rw*/ = 32'd0;
    logic [31:0] tb_nreads /*verilator public_flat_rw*/ = 32'd0;
    logic [31:0] tb_nwrites /*verilator public_flat_rw*/ = 32'd0;
    logic [63:0] tb_clk_count /*verilator public_flat_rw*/ = 64'd0;
    logic        tb_nme_busy /*verilator public_flat_rw*/;
    logic        tb_nme_done /*verilator public_flat_rw*/;

    // ---------------------------------------------------------------- the shared memory
    import "DPI-C" function int coda_mem_open(input string path, input int words,
                                              input int lanes);
    import "DPI-C" function void coda_mem_read(input int h, input int addr,
                                               output bit [WB-1:0] data);
    import "DPI-C" function void coda_mem_write(input int h, input int addr,
                                                input bit [WB-1:0] data,
                                                input bit [LANES-1:0] mask);
    import "DPI-C" function void coda_mem_run_start(input int h);
    import "DPI-C" function int coda_mem_ndirty(input int h);
    import "DPI-C" function void coda_mem_clear(input int h);

    string mem_shm_path = "mem.shm", cmd_in_path = "cmd_in.hex";
    int mem_h = -1;                    // the memory's handle (shared_mem.cpp)
    initial begin
        void'($value$plusargs("MEM_SHM=%s", mem_shm_path));
        void'($value$plusargs("CMD_IN=%s", cmd_in_path));
        mem_h = coda_mem_open(mem_shm_path, MEM_WORDS, LANES);
        if (mem_h < 0) $fatal(1, "+MEM_SHM=%s: cannot map a %0d-word, %0d-lane memory (error %0d)",
                              mem_shm_path, MEM_WORDS, LANES, mem_h);
    end

    // ---------------------------------------------------------------- the NME
    logic          cmd_valid, cmd_ready;
    logic [63:0]   cmd_data;
    logic          mem_req_valid, mem_req_ready, mem_req_we;
    logic [23:0]   mem_req_addr;
    logic [WB-1:0] mem_req_wdata;
    logic [LANES-1:0] mem_req_wmask;
    logic          mem_rsp_valid;
    logic [WB-1:0] mem_rsp_data;
    logic          busy, done;
    logic [2:0]    status;
    logic [31:0]   l1;
    logic [63:0]   toggles;

    `NME_MODULE dut (
        .clk(clk), .rst(rst),
        .cmd_valid(cmd_valid), .cmd_ready(cmd_ready), .cmd_data(cmd_data),
        .mem_req_valid(mem_req_valid), .mem_req_ready(mem_req_ready), .mem_req_we(mem_req_we),
        .mem_req_addr(mem_req_addr), .mem_req_wdata(mem_req_wdata),
        .mem_req_wmask(mem_req_wmask),
        .mem_rsp_valid(mem_rsp_valid), .mem_rsp_data(mem_rsp_data),
`ifdef HAS_DBG_FU_TOGGLES
        .dbg_fu_toggles(toggles[TOG_W-1:0]),
`endif
        .busy(busy), .done(done), .status(status), .l1(l1)
    );
`ifdef HAS_DBG_FU_TOGGLES
    if (TOG_W < 64) begin : g_tog_pad
        assign toggles[63:TOG_W] = '0;
    end
`else
    assign toggles = 64'd0;
`endif
    assign tb_nme_busy = busy;
    assign tb_nme_done = done;

    // ---------------------------------------------------------------- stall generator
    // xorshift32: the low half decides request stalls, the high half response stalls.
    logic [31:0] lfsr = 32'h1;
    function automatic logic [31:0] xorshift32(input logic [31:0] x);
        x = x ^ (x << 13);
        x = x ^ (x >> 17);
        x = x ^ (x << 5);
        return x;
    endfunction
    wire req_stall = lfsr[15:0] < tb_req_stall;
    wire rsp_stall = lfsr[31:16] < tb_rsp_stall;

    // ---------------------------------------------------------------- memory
    logic [WB-1:0] rsp_data [RSP_DEPTH];
    logic [63:0]   rsp_due [RSP_DEPTH];
    logic [RSP_AW-1:0] rsp_head = '0, rsp_tail = '0;
    logic [RSP_AW:0]   rsp_count = '0;

    assign mem_req_ready = !req_stall;
    assign mem_rsp_valid = (rsp_count != 0) && (rsp_due[rsp_head] <= tb_clk_count) && !rsp_stall;
    // Invalid cycles carry noise, so an NME that samples data without valid is caught.
    assign mem_rsp_data = mem_rsp_valid ? rsp_data[rsp_head] : {LANES{lfsr[31:16]}};

    // ---------------------------------------------------------------- command feeder + jobs
    typedef enum logic [1:0] { J_IDLE, J_RUN } job_state_t;
    job_state_t    jstate = J_IDLE;
    logic [63:0]   cmd_buf [CMD_DEPTH];
    logic [15:0]   cmd_idx = 16'd0;
    logic [31:0]   last_req = 32'd0;
    logic [63:0]   toggles_at_start = 64'd0;

    assign cmd_valid = (jstate == J_RUN) && (cmd_idx < tb_ncmd);
    assign cmd_data = cmd_buf[cmd_idx[$clog2(CMD_DEPTH)-1:0]];

    task automatic finish_job(input logic timed_out);
        tb_status <= status;
        tb_l1 <= l1;
        tb_toggles <= toggles - toggles_at_start;
        tb_cmd_left <= tb_ncmd - cmd_idx;
        tb_rsp_left <= 32'(rsp_count);
        tb_timeout <= timed_out;
        tb_ndirty <= 32'(coda_mem_ndirty(mem_h));
        tb_ack <= last_req;
        jstate <= J_IDLE;
    endtask

    always @(posedge clk) begin
        tb_clk_count <= tb_clk_count + 64'd1;
        lfsr <= xorshift32(lfsr);
        // The memory is not reset with the NME: a request transfers on valid & ready at any
        // edge (also one the NME resets at) and reads in flight are still answered (the NME
        // counts them across its reset).
        if (mem_req_valid && mem_req_ready) begin
            if (32'(mem_req_addr) >= MEM_WORDS) begin
                tb_oob <= tb_oob + 32'd1;
            end else if (mem_req_we) begin
                coda_mem_write(mem_h, 32'(mem_req_addr), mem_req_wdata, mem_req_wmask);
                tb_nwrites <= tb_nwrites + 32'd1;
            end
            if (!mem_req_we) begin
                bit [WB-1:0] word;
                word = '0;
                if (32'(mem_req_addr) < MEM_WORDS) coda_mem_read(mem_h, 32'(mem_req_addr), word);
                if (rsp_count == (RSP_AW+1)'(RSP_DEPTH)) tb_overflow <= tb_overflow + 32'd1;
                rsp_data[rsp_tail] <= word;
                rsp_due[rsp_tail] <= tb_clk_count + 64'(tb_latency == 0 ? 8'd1 : tb_latency);
                rsp_tail <= rsp_tail + 1'b1;
                tb_nreads <= tb_nreads + 32'd1;
            end
        end
        rsp_count <= rsp_count + ((mem_req_valid && mem_req_ready && !mem_req_we) ? 1 : 0)
                               - (mem_rsp_valid ? 1 : 0);
        if (mem_rsp_valid) rsp_head <= rsp_head + 1'b1;

        if (rst) begin
            cmd_idx <= 16'd0;
            if (jstate != J_IDLE) begin
                tb_aborted <= 1'b1;
                tb_ack <= last_req;
                jstate <= J_IDLE;
            end
        end else begin
            if (cmd_valid && cmd_ready) cmd_idx <= cmd_idx + 16'd1;

            case (jstate)
                J_IDLE: begin
                    if (done) tb_stray_done <= tb_stray_done + 32'd1;
                    if (tb_req != last_req) begin
                        last_req <= tb_req;
                        case (tb_op)
                            OP_CLEAR: begin
                                coda_mem_clear(mem_h);
                                tb_ack <= tb_req;
                            end
                            OP_RUN: begin
                                $readmemh(cmd_in_path, cmd_buf);
                                coda_mem_run_start(mem_h);
                                cmd_idx <= 16'd0;
                                tb_cycles <= 32'd0;
                                tb_timeout <= 1'b0;
                                tb_aborted <= 1'b0;
                                tb_ndirty <= 32'd0;
                                tb_oob <= 32'd0;
                                tb_overflow <= 32'd0;
                                tb_stray_done <= 32'd0;
                                tb_nreads <= 32'd0;
                                tb_nwrites <= 32'd0;
                                toggles_at_start <= toggles;
                                lfsr <= (tb_seed == 0) ? 32'h2545F491 : tb_seed;
                                jstate <= J_RUN;
                            end
                            default: tb_ack <= tb_req;  // unknown op: acknowledge, do nothing
                        endcase
                    end
                end
                J_RUN: begin
                    tb_cycles <= tb_cycles + 32'd1;
                    if (done) finish_job(1'b0);
                    else if (tb_cycles >= tb_max_cycles) finish_job(1'b1);
                end
                default: jstate <= J_IDLE;
            endcase
        end
    end
endmodule
